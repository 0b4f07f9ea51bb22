"""Workflows, one file each: the task, the turn order between roles, the shared history and the
reward each role earns. The env interface and the 3-agent math team arrive with issue #5."""
