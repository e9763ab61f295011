"""The test project serves nothing over HTTP."""

urlpatterns: list[object] = []
