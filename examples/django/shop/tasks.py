"""The shop's tasks: found by ``manage.py conveyor_worker`` as ``shop.tasks.*``."""

from __future__ import annotations

from typing import Any

from django.tasks import task

from shop.models import Order


@task
def send_receipt(order_id: int) -> dict[str, Any]:
    """Mark the order's receipt sent (a real shop would send an email here)."""
    order = Order.objects.get(id=order_id)
    order.receipt_sent = True
    order.save(update_fields=["receipt_sent"])
    return {"order": order.id, "to": order.email}


@task(queue_name="reports", takes_context=True, timeout="10m")
def sales_report(context: Any, days: int) -> dict[str, Any]:
    """Sum the orders day by day, reporting progress on the dashboard as it goes."""
    total = sum(Order.objects.values_list("total_cents", flat=True))
    for day in range(days):
        context.job.progress(day + 1, days, f"day {day + 1} of {days}")
    return {"days": days, "total_cents": total, "attempt": context.attempt}
