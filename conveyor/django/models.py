"""No Django models: conveyor's tables are its own, created by its migrations.

This module exists so that Django sends the app its ``post_migrate`` signal (it does so
only for apps with a models module), on which conveyor's later migrations are applied.
"""
