"""Imports a module that does not exist."""
import torch
import not_a_real_module_xyz  # noqa: F401


def workload():
    return None
