"""The example shop's URLs."""

from django.urls import path
from shop import views

urlpatterns = [
    path("orders/", views.place_order),
    path("reports/", views.request_report),
    path("tasks/<str:result_id>/", views.task_status),
]
