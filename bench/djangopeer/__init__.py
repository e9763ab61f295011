"""A Django project for bench/django_peer.py: one database, conveyor's backend and
django-tasks-db's side by side."""
