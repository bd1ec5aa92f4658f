"""Streamlit dashboard for gpudiag runs (presentation only: see app.py)."""
