"""gpulab: the library behind the book "DNN Computing on GPUs", laid out like the book.

- ``gpulab.core``: what every chapter uses -- the device and where kernels run (``env``, ``kernel_mode``,
  ``banner``), honest timers (``timing``, ``clocks``), the device's measured rates (``rates``), recordings and
  their provenance (``recordings``, ``provenance``), checks of results and arguments (``correctness``,
  ``validation``, ``sweep``), the models the chapters share (``specs``, ``flops``, ``roofline``, ``precision``,
  ``occupancy``, ``profiling``), and the page's figures, widgets and listings (``plots``, ``widgets``,
  ``printing``). It imports nothing above it.
- ``gpulab.kernels``: the course's CUDA C kernels (``NN_name.cu``) and numba kernels, with their compiler.
- ``gpulab.chNN_topic``: one package per chapter, named after its notebook ``notebooks/NN_topic.ipynb``, split by
  job (experiments, models, ``figures``, ``explorer``). A chapter imports the core, the kernels and earlier chapters.
- ``gpulab.labs``: the grading framework (``grading``) and the graders of the labs that diagnose a student's code
  (``labNN_topic``, after ``labs/NN_topic.ipynb``). Nothing imports a grader or an explorer.

``tests/test_layers.py`` enforces these layers.
"""

from pathlib import Path

__version__ = "0.2.0"

SRC = Path(__file__).resolve().parents[1]  # the folder that holds the gpulab package
