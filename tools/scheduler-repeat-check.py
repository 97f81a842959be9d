#!/usr/bin/env python3
"""What diffusers' FlowMatchEulerDiscreteScheduler does when timesteps[0] repeats.

tests/test_scheduler.c (test_errors) expects this behaviour: with shift=1e7 and 28 steps the
first sigmas saturate at 1, the first step() without set_begin_index looks the timestep up and
takes its second match (index 1), so 27 steps run and the 28th raises IndexError.
Run with a Python that has torch and diffusers (not needed by the tests)."""
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

s = FlowMatchEulerDiscreteScheduler(shift=1e7)
s.set_timesteps(28)
print("timesteps[:3]", s.timesteps[:3].tolist())
x, v = torch.zeros(3), torch.ones(3)
ran = 0
try:
    for _ in range(40):
        s.step(v, s.timesteps[0], x)
        ran += 1
except IndexError as e:
    print("IndexError:", e)
print("steps that ran without set_begin_index:", ran)
s.set_timesteps(28)
s.set_begin_index(0)
ran = 0
try:
    for _ in range(40):
        s.step(v, s.timesteps[0], x)
        ran += 1
except IndexError:
    pass
print("steps that ran with set_begin_index(0):", ran)
