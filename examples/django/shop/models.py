"""An order, whose receipt a task sends."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    email = models.EmailField()
    total_cents = models.PositiveIntegerField()
    receipt_sent = models.BooleanField(default=False)
