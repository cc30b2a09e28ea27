"""Fairness audit: NDKL (SISPI), NDCG/AP, VisoGender-style gender bias, before and after each correction."""

from hubless.fairness.audit import FairnessAudit, FairnessResult, audit, encode_attribute
from hubless.fairness.measures import average_precision, gender_bias_at_n, joint_codes, ndcg, ndkl

__all__ = [
    "FairnessAudit",
    "FairnessResult",
    "audit",
    "average_precision",
    "encode_attribute",
    "gender_bias_at_n",
    "joint_codes",
    "ndcg",
    "ndkl",
]
