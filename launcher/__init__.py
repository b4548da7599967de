"""What runs outside ranks: ``stratacl-launch``, process supervision, the bootstrap daemon."""
