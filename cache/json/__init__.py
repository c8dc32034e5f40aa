"""JSON text: the codec of this interpreter, strict input (I-JSON, RFC 8259), spans, merge patch."""
