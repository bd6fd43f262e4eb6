"""Lab 11, "All-reduce" (``labs/11_all_reduce.ipynb``): the reference ring and what the grader watches
(:mod:`.ring`), the code each worker process runs (:mod:`.worker`), and the graders (:mod:`.diagnose`).
"""
