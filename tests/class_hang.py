"""A class-grading test submission that never finishes importing."""
import time

time.sleep(3600)
