"""REST API (FastAPI) and the pages of the event browser."""
