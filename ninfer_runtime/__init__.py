"""The inference engine: models, backends, scheduler, frontend."""
