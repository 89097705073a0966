"""The Celery worker: tasks (:mod:`.tasks`), the processing services they call
(:mod:`.processing` for a product, :mod:`.gpu_batch` for a GPU batch).

Only a worker process (``lstdp worker``) and the tests import this package; the API sends
work by task name through :mod:`backend.broker`.
"""
