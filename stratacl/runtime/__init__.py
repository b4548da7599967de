"""What runs inside a rank: bootstrap client, HBM segments, VA window, allocators, mailbox, communicator."""
