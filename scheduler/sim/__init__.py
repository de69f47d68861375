"""Simulators of the scheduler and of whole clusters on a virtual clock: they drive the real policies of `scheduler/` with step-time models, no sockets and no device."""
