"""First-party plugins, registered exactly like third-party ones."""
