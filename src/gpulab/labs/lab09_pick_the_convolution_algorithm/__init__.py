"""Lab 09, "Pick the convolution algorithm" (``labs/09_pick_the_convolution_algorithm.ipynb``): the settings a
convolution can run in and their measurement (:mod:`.settings`), and the graders of a student's preparation,
precision switch, timer and prediction (:mod:`.diagnose`).
"""
