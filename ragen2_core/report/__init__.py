"""Comparative sweep reports: collect (MLflow) -> analysis (stats) -> figures -> build (PDF, CSV, JSON).

    from ragen2_core.report.build import build_report, main, add_arguments
"""
