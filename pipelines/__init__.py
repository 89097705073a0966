"""LST science pipelines: calibration steps, simulation, detectors, catalogue parsers and
the Celery tasks that run them. Science functions here never touch the database, the
broker or global settings."""
