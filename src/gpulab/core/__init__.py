"""The core every chapter uses: the device, timers, recordings and provenance, checks, shared models and the
page's figures, widgets and listings. It imports nothing above it (no chapter, lab or kernel module).
"""
