"""Training data: chat-log importers, redaction, and dataset validation.

importers.py  record layouts, one pure function per format (openai, anthropic, messages, langsmith)
responses.py  OpenAI Responses API records (read by -f openai)
gemini.py     Gemini generateContent records (-f gemini)
otel.py       OpenTelemetry spans of LLM calls (-f otel): OTLP/JSON and the GenAI conventions
otel_flat.py  OpenLLMetry's and OpenInference's flattened span attributes
chains.py     joining Responses records along previous_response_id (a spool file)
traces.py     streaming OTLP exports: one record per span, --join-trace
messages.py   the normalized message shape; converting one message; finalizing a conversation
redact.py     personal data and secrets -> typed placeholders
import_cmd.py `rlcli import`: streaming I/O, feedback spooling, the summary
validate.py   check a conversations file before `train sl` reads it
"""
