"""The Anthropic front door: Messages and token counting."""
