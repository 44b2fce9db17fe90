"""Scripts run *by path* inside the Gym runtime interpreter (standard library only)."""
