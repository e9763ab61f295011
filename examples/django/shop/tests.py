"""The shop's tests, with conveyor's testing kit (``conveyor.testing.JobTester``).

``python manage.py test shop`` runs them. The tester points the task backend's conveyor
application at a temporary database with a fake clock; the view enqueues through
Django's own API, and ``drain()`` runs the due tasks in-process through a real worker.
"""

from __future__ import annotations

from django.tasks import task_backends
from django.test import TransactionTestCase

from conveyor.testing import JobTester
from shop.models import Order


class PlaceOrderTests(TransactionTestCase):
    async def test_an_order_enqueues_its_receipt_which_runs(self) -> None:
        app = task_backends["default"].app
        async with JobTester(app) as jobs:
            response = await self.async_client.post(
                "/orders/", {"email": "a@b.c", "total_cents": 990}, content_type="application/json"
            )
            self.assertEqual(response.status_code, 201)
            order_id = response.json()["order"]
            job = await jobs.assert_submitted(
                "shop.tasks.send_receipt", payload={"args": [order_id]}, max_attempts=5
            )
            self.assertEqual(job.id, response.json()["task"])  # the result id is the job's
            ran = await jobs.drain()
            self.assertEqual(ran.succeeded, [job.id])
            order = await Order.objects.aget(id=order_id)
            self.assertTrue(order.receipt_sent)

    async def test_a_bad_order_enqueues_nothing(self) -> None:
        app = task_backends["default"].app
        async with JobTester(app) as jobs:
            response = await self.async_client.post(
                "/orders/", {"email": "a@b.c"}, content_type="application/json"
            )
            self.assertEqual(response.status_code, 400)
            await jobs.assert_not_submitted("shop.tasks.send_receipt")

    async def test_the_report_reports_progress(self) -> None:
        app = task_backends["default"].app
        async with JobTester(app) as jobs:
            response = await self.async_client.post("/reports/?days=3")
            job_id = response.json()["task"]
            await jobs.drain(queues=["reports"])
            job = await app.get(job_id)
            self.assertEqual(job.record.result, {"days": 3, "total_cents": 0, "attempt": 1})
            self.assertEqual(job.record.progress.message, "day 3 of 3")
