"""The paper's evaluation, shared by the simulator and the lab: its columns and tables
(:mod:`evaluation.columns`) and its plots (:mod:`evaluation.plots`, matplotlib).
"""
