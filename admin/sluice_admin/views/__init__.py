"""One module per page. Each is run by Streamlit as a script and renders when run so."""
