"""The OpenAI front door: Chat Completions and Responses."""
