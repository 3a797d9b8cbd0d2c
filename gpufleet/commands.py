"""Commands beyond validation: reconciler, agent, drills, local environment, previews."""
