"""The JSON-native store: documents kept in Redis as the bytes that are sent."""
