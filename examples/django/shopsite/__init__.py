"""The example shop's project package: settings and URLs."""
