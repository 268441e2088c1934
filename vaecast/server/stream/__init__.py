"""The stream core: jobs, their runners and manager, the segment log, the fan-out."""
