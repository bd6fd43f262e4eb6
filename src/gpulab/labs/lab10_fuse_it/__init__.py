"""Lab 10, "Fuse it" (``labs/10_fuse_it.ipynb``): the reference answers and kernels (:mod:`.reference`), the
graders (:mod:`.diagnose`), and the measurement against a copy (:mod:`.measure`).
"""
