"""Helpers to drive the dashboard in headless Chromium (tests and bench/dashboard.py)."""
