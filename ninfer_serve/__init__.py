"""The HTTP server (OpenAI and Anthropic compatible)."""
