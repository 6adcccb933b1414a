"""Value pools the built-in databases draw from: short, realistic-looking, free of quotes."""

FIRST_NAMES = [
    "Ana", "Ben", "Carla", "David", "Elena", "Felix", "Grace", "Hugo", "Ines", "Jonas", "Kira", "Leo",
    "Maya", "Nico", "Olga", "Pablo", "Quinn", "Rosa", "Sam", "Tara", "Umar", "Vera", "Wes", "Xena",
    "Yuri", "Zoe", "Amir", "Bea", "Caio", "Dina", "Emil", "Fay", "Gil", "Hana", "Ivo", "Jade",
]
LAST_NAMES = [
    "Silva", "Novak", "Berg", "Costa", "Diaz", "Evans", "Fischer", "Garcia", "Hale", "Ito", "Jensen",
    "Khan", "Lopez", "Moreau", "Nagy", "Olsen", "Perez", "Quist", "Rossi", "Sato", "Torres", "Ueda",
    "Varga", "Weber", "Young", "Zeller", "Kowal", "Marin", "Reyes", "Stone", "Brooks", "Lind",
]
ADJECTIVES = [
    "Silent", "Golden", "Broken", "Electric", "Quiet", "Velvet", "Hidden", "Wild", "Crimson", "Frozen",
    "Distant", "Bright", "Lonely", "Secret", "Falling", "Endless", "Paper", "Neon", "Savage", "Gentle",
    "Burning", "Silver", "Hollow", "Blue",
]
NOUNS = [
    "River", "Road", "Garden", "Dream", "Storm", "Mirror", "Harbor", "Forest", "Echo", "Horizon", "Flame",
    "Island", "Shadow", "Sky", "Tide", "Valley", "Winter", "Window", "Letter", "Crown", "Bridge", "Moon",
    "Desert", "Signal",
]
BAND_WORDS = [
    "Foxes", "Pilots", "Wolves", "Comets", "Sparrows", "Giants", "Ravens", "Echoes", "Tigers", "Lanterns",
    "Owls", "Rivals", "Drifters", "Saints", "Rockets", "Hounds",
]
CITIES = ["Lisbon", "Porto", "Madrid", "Paris", "Berlin", "Rome", "Oslo", "Vienna", "Dublin", "Prague"]
COUNTRIES = ["Portugal", "Spain", "France", "Germany", "Italy", "Norway", "Japan", "Brazil", "Canada", "Kenya"]
MUSIC_GENRES = ["Rock", "Jazz", "Pop", "Folk", "Blues", "Metal"]
BOOK_GENRES = ["Mystery", "Fantasy", "Romance", "History", "Poetry", "Science"]
DEPARTMENTS = ["Physics", "History", "Biology", "Economics", "Mathematics", "Chemistry", "Philosophy", "Music"]
BUILDINGS = ["North Hall", "South Hall", "Main Tower", "Lab Wing"]
COURSE_TOPICS = [
    "Mechanics", "Optics", "Ancient Rome", "Genetics", "Ecology", "Microeconomics", "Statistics",
    "Algebra", "Calculus", "Organic Chemistry", "Logic", "Ethics", "Harmony", "Thermodynamics",
    "Cell Biology", "Game Theory", "Topology", "Medieval Europe", "Quantum Theory", "Acoustics",
    "Number Theory", "Biochemistry", "Metaphysics", "Econometrics", "Zoology", "Geometry",
    "Electronics", "Renaissance Art", "Composition", "Probability",
]
SPECIALTIES = ["Cardiology", "Neurology", "Pediatrics", "Oncology", "Dermatology", "Surgery"]
BLOOD_TYPES = ["A", "B", "AB", "O"]
APPOINTMENT_STATUS = ["completed", "cancelled", "scheduled"]
PRODUCT_CATEGORIES = ["Electronics", "Kitchen", "Garden", "Toys", "Books", "Sports"]
PRODUCT_NAMES = [
    "Desk Lamp", "Blender", "Coffee Maker", "Garden Hose", "Puzzle Box", "Tennis Racket", "Cookbook",
    "Headphones", "Toaster", "Rake", "Kite", "Yoga Mat", "Atlas", "Keyboard", "Kettle", "Shovel",
    "Robot Kit", "Football", "Novel Set", "Webcam", "Frying Pan", "Flower Pot", "Board Game", "Bicycle Bell",
    "Notebook", "Speaker", "Wok", "Watering Can", "Teddy Bear", "Dumbbell", "Dictionary", "Monitor",
    "Mixer", "Hammock", "Drone", "Skipping Rope",
]
SEGMENTS = ["retail", "business", "student"]
CHANNELS = ["online", "store", "phone"]
AIRLINES = [
    "SkyJet", "Aurora Air", "BlueWing", "Nordic Air", "SunFly", "Atlas Airways", "Coral Air", "Polar Jet",
    "Vista Air", "Swift Air", "Terra Air", "Zenith Air",
]
AIRPORTS = [
    ("LIS", "Lisbon", "Portugal"), ("OPO", "Porto", "Portugal"), ("MAD", "Madrid", "Spain"),
    ("BCN", "Barcelona", "Spain"), ("CDG", "Paris", "France"), ("NCE", "Nice", "France"),
    ("BER", "Berlin", "Germany"), ("MUC", "Munich", "Germany"), ("FCO", "Rome", "Italy"),
    ("MXP", "Milan", "Italy"), ("OSL", "Oslo", "Norway"), ("HND", "Tokyo", "Japan"),
    ("GRU", "Sao Paulo", "Brazil"), ("YYZ", "Toronto", "Canada"), ("NBO", "Nairobi", "Kenya"),
    ("DUB", "Dublin", "Ireland"),
]
TEAM_CITIES = ["Lisbon", "Porto", "Madrid", "Paris", "Berlin", "Rome", "Oslo", "Vienna", "Dublin", "Prague", "Milan", "Lyon"]
TEAM_MASCOTS = ["Lions", "Eagles", "Sharks", "Bears", "Falcons", "Wolves", "Dragons", "Bulls", "Hawks", "Tigers", "Storm", "Rangers"]
POSITIONS = ["Goalkeeper", "Defender", "Midfielder", "Forward"]
