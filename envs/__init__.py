"""Workflows, one file each: the task, the turn order between roles, the shared history and the
reward each role earns. The interface every env implements is documented in math_3agent.py."""
