"""A small, real Django project the Django backend's tests run: settings and tasks."""
