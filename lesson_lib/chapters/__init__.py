"""What each notebook calls: one function per cell, each running milestones and drawing plots."""
