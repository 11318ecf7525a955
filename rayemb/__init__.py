"""rayemb."""
