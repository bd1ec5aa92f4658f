"""Presentation of an AnalysisResult: terminal (rich), standalone HTML (plotly), JSON.

Each renderer imports its library only when called, so `gpudiag analyze --json` never
loads rich or plotly.
"""
