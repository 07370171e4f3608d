"""backends/ray"""
