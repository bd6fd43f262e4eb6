"""The labs' graders: the grading framework (:mod:`~gpulab.labs.grading`) and one module per lab that
diagnoses a student's code, named after its notebook (``labs/NN_topic.ipynb`` -> ``labNN_topic``).
"""
