"""A job as a value: its record and the transitions that change it, its snapshot
for the store, and the views that render it. No I/O.
"""
