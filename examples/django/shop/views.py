"""The shop's views: placing an order enqueues its receipt in the same transaction."""

from __future__ import annotations

import json

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.tasks import default_task_backend
from django.tasks.exceptions import TaskResultDoesNotExist
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from shop import tasks
from shop.models import Order


@csrf_exempt
@require_POST
def place_order(request: HttpRequest) -> JsonResponse:
    """Store the order and enqueue its receipt: both, or (on any error) neither."""
    body = json.loads(request.body or b"{}")
    try:
        email, total = str(body["email"]), int(body["total_cents"])
    except (KeyError, TypeError, ValueError):
        return JsonResponse({"error": "give email and total_cents"}, status=400)
    with transaction.atomic():
        order = Order.objects.create(email=email, total_cents=total)
        receipt = tasks.send_receipt.enqueue(order.id)
    return JsonResponse({"order": order.id, "task": receipt.id}, status=201)


@csrf_exempt
@require_POST
def request_report(request: HttpRequest) -> JsonResponse:
    result = tasks.sales_report.enqueue(days=int(request.GET.get("days", "7")))
    return JsonResponse({"task": result.id}, status=202)


@require_GET
def task_status(request: HttpRequest, result_id: str) -> JsonResponse:
    try:
        result = default_task_backend.get_result(result_id)
    except TaskResultDoesNotExist:
        return JsonResponse({"error": f"no task {result_id}"}, status=404)
    return JsonResponse(
        {
            "task": result.task.module_path,
            "status": result.status,
            "return_value": result.return_value if result.status == "SUCCESSFUL" else None,
            "errors": [e.exception_class_path for e in result.errors],
        }
    )
