"""The real-engine room: vLLM's CPU build serving a tiny checkpoint, driven by the tests here
(`make real-engine` installs it and runs them)."""
