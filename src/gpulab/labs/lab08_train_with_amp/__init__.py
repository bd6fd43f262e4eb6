"""Lab 08, "Train with AMP" (``labs/08_train_with_amp.ipynb``): a probe model to run a student's AMP training
step on (:mod:`.probe`), and the graders that say what the step got wrong (:mod:`.diagnose`).
"""
