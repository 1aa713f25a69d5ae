"""Evaluation: metrics (product code: training fits and reports with them) and the offline
reports (research: the transfer report, ablations, tables and plots)."""
