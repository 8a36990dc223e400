"""`euler serve`: an OpenAI-compatible HTTP API and a chat page over a checkpoint.

protocol (request bodies and errors), scheduler (the model's thread, batching requests),
app (the FastAPI routes and the event stream), run (loading and serving), page.html (the
chat page). FastAPI and uvicorn come with the serve extra: pip install -e '.[serve]'.
"""
