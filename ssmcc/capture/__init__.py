"""Capture: torch.export with dynamic dims, known SSM implementations routed to the ssmcc ops."""

from ssmcc.capture.export import REPORT_KEY, capture, capture_with_report
from ssmcc.capture.inputs import check_token_ids
from ssmcc.capture.report import CaptureReport, ssmcc_op_counts

__all__ = [
    "REPORT_KEY",
    "CaptureReport",
    "capture",
    "capture_with_report",
    "check_token_ids",
    "ssmcc_op_counts",
]
