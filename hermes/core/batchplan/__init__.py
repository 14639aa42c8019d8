"""SamuLLM's multi-LLM offline batch planner (pure)."""
