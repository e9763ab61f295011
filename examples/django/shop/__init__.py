"""The example shop: orders, a receipt task and a report task with progress."""
