"""Scripts the store suites run as separate processes (crash writer, memory probe)."""
