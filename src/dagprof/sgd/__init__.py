"""The layer-wise DAG model of synchronous SGD (Shi, Wang, Chu, Li 2018): graph, closed forms, policies."""
from .closed import Prediction, closed_form, wfbp_tau
from .comm import CommModel, comm_model, link_from_text
from .contention import Contention, contended_replay
from .dag import build_sgd_graph, replay_schedule
from .predict import Scaling, ScalingRow, anchor, anchor_single_worker, measured_iteration_note, predict
from .schedule import Policy, Schedule, make_schedule, merge_groups

__all__ = [
    "CommModel",
    "Contention",
    "Policy",
    "Prediction",
    "Scaling",
    "ScalingRow",
    "Schedule",
    "anchor",
    "anchor_single_worker",
    "build_sgd_graph",
    "closed_form",
    "comm_model",
    "contended_replay",
    "link_from_text",
    "make_schedule",
    "measured_iteration_note",
    "merge_groups",
    "predict",
    "replay_schedule",
    "wfbp_tau",
]
