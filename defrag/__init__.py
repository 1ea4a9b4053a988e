"""Defragmentation that moves pods (#31): the plan, proven by simulation, and what carries it out."""
